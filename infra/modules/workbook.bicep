// The fleet's maintenance workbook (main.bicep workbookEnabled): events by type and state, the
// notice given, announced against measured impact, held events and the time from notice to
// approval, over the summary lines the history workflow logs to Application Insights
// (functions/history/core.py, summary_line; docs/monitoring.md "Event history"). The workbook itself is
// workbook.json, loaded as it is, so a test can read its queries.

@description('Azure region.')
param location string

@description('Resource id of the Application Insights component the Function App logs to.')
param appInsightsId string

@description('Name shown in the portal.')
param displayName string

@description('Tags for every resource.')
param tags object = {}

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, appInsightsId, 'sebridge-fleet-maintenance')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    sourceId: appInsightsId
    serializedData: loadTextContent('workbook.json')
  }
}

@description('Resource id of the workbook.')
output id string = workbook.id
